// ForgeScale: a minimal custom TensorRT plugin (IPluginV2DynamicExt) that multiplies its input by a
// constant. It exists to exercise trtllm-forge's custom-plugin path end to end: build with CMake, preload
// with LD_PRELOAD into trtllm-build and tritonserver, record path + sha256 in the build manifest.
#include <NvInfer.h>
#include <NvInferRuntime.h>

#include <cstring>
#include <string>
#include <vector>

#include "scale_kernel.h"

using namespace nvinfer1;

namespace {

char const* const kName = "ForgeScale";
char const* const kVersion = "1";

class ScalePlugin : public IPluginV2DynamicExt {
public:
    explicit ScalePlugin(float scale) : mScale(scale) {}
    ScalePlugin(void const* data, size_t length) {
        if (length == sizeof(float)) {
            std::memcpy(&mScale, data, sizeof(float));
        }
    }

    // IPluginV2DynamicExt
    IPluginV2DynamicExt* clone() const noexcept override {
        auto* copy = new ScalePlugin(mScale);
        copy->setPluginNamespace(mNamespace.c_str());
        return copy;
    }
    DimsExprs getOutputDimensions(int32_t, DimsExprs const* inputs, int32_t, IExprBuilder&) noexcept override {
        return inputs[0];
    }
    bool supportsFormatCombination(int32_t pos, PluginTensorDesc const* inOut, int32_t, int32_t) noexcept override {
        PluginTensorDesc const& desc = inOut[pos];
        bool const typeOk = desc.type == DataType::kFLOAT || desc.type == DataType::kHALF;
        bool const sameAsInput = pos == 0 || desc.type == inOut[0].type;
        return typeOk && sameAsInput && desc.format == TensorFormat::kLINEAR;
    }
    void configurePlugin(DynamicPluginTensorDesc const*, int32_t, DynamicPluginTensorDesc const*, int32_t) noexcept override {}
    size_t getWorkspaceSize(PluginTensorDesc const*, int32_t, PluginTensorDesc const*, int32_t) const noexcept override { return 0; }
    int32_t enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const*, void const* const* inputs, void* const* outputs,
                    void*, cudaStream_t stream) noexcept override {
        long long count = 1;
        for (int32_t i = 0; i < inputDesc[0].dims.nbDims; ++i) {
            count *= inputDesc[0].dims.d[i];
        }
        return forgeLaunchScale(inputs[0], outputs[0], mScale, count, inputDesc[0].type == DataType::kHALF, stream);
    }

    // IPluginV2Ext
    DataType getOutputDataType(int32_t, DataType const* inputTypes, int32_t) const noexcept override { return inputTypes[0]; }

    // IPluginV2
    char const* getPluginType() const noexcept override { return kName; }
    char const* getPluginVersion() const noexcept override { return kVersion; }
    int32_t getNbOutputs() const noexcept override { return 1; }
    int32_t initialize() noexcept override { return 0; }
    void terminate() noexcept override {}
    size_t getSerializationSize() const noexcept override { return sizeof(float); }
    void serialize(void* buffer) const noexcept override { std::memcpy(buffer, &mScale, sizeof(float)); }
    void destroy() noexcept override { delete this; }
    void setPluginNamespace(char const* ns) noexcept override { mNamespace = ns ? ns : ""; }
    char const* getPluginNamespace() const noexcept override { return mNamespace.c_str(); }

private:
    float mScale{1.0F};
    std::string mNamespace;
};

class ScalePluginCreator : public IPluginCreator {
public:
    ScalePluginCreator() {
        mFields.emplace_back(PluginField("scale", nullptr, PluginFieldType::kFLOAT32, 1));
        mCollection.nbFields = static_cast<int32_t>(mFields.size());
        mCollection.fields = mFields.data();
    }
    char const* getPluginName() const noexcept override { return kName; }
    char const* getPluginVersion() const noexcept override { return kVersion; }
    PluginFieldCollection const* getFieldNames() noexcept override { return &mCollection; }
    IPluginV2* createPlugin(char const*, PluginFieldCollection const* fc) noexcept override {
        float scale = 1.0F;
        for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i) {
            if (std::strcmp(fc->fields[i].name, "scale") == 0 && fc->fields[i].data != nullptr) {
                scale = *static_cast<float const*>(fc->fields[i].data);
            }
        }
        auto* plugin = new ScalePlugin(scale);
        plugin->setPluginNamespace(mNamespace.c_str());
        return plugin;
    }
    IPluginV2* deserializePlugin(char const*, void const* data, size_t length) noexcept override {
        auto* plugin = new ScalePlugin(data, length);
        plugin->setPluginNamespace(mNamespace.c_str());
        return plugin;
    }
    void setPluginNamespace(char const* ns) noexcept override { mNamespace = ns ? ns : ""; }
    char const* getPluginNamespace() const noexcept override { return mNamespace.c_str(); }

private:
    std::vector<PluginField> mFields;
    PluginFieldCollection mCollection{};
    std::string mNamespace;
};

}  // namespace

// Registers the creator when the library is loaded (LD_PRELOAD or dlopen), before any engine is built or deserialized.
REGISTER_TENSORRT_PLUGIN(ScalePluginCreator);
